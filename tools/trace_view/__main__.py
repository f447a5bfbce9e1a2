import sys

from tools.trace_view import main

sys.exit(main())
