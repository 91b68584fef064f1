from bench.tools.quality.sweep import main

raise SystemExit(main())
