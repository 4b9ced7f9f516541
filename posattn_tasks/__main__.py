import sys

from posattn_tasks.cli import main

sys.exit(main())
