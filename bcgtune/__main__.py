from bcgtune.cli.app import main

main()
