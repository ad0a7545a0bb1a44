from headrank.cli import main

main()
