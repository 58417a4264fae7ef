from sim.cli import main

raise SystemExit(main())
