from attnrank.cli import main

main()
