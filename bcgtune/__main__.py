from bcgtune.cli.app import main

if __name__ == "__main__":  # not when a spawned worker process imports this module
    main()
