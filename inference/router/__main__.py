from inference.router.server import main

raise SystemExit(main())
