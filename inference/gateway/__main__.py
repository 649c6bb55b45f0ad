from inference.gateway.server import main

raise SystemExit(main())
