from tandem_bench.cli import main

raise SystemExit(main())
