"""`python -m paretolab.cli ...`: what a Ray job's entrypoint runs."""

from paretolab.cli import main

raise SystemExit(main())
