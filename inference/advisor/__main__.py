from inference.advisor.cli import main

raise SystemExit(main())
