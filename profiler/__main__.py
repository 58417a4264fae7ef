from profiler.cli import main

raise SystemExit(main())
