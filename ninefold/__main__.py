"""python -m ninefold: the CLI."""
from ninefold.cli.main import main

main()
