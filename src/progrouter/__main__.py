from progrouter.cli import main

raise SystemExit(main())
