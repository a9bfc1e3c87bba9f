from tandem.router.cli import main

main()
