from ebpflb.cli import main

raise SystemExit(main())
