import sys

from radixchat.cli import main

sys.exit(main())
