from blobmount.cli import main

raise SystemExit(main())
