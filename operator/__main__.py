from tandem.operator.cli import main

main()
