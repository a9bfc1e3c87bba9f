from tandem.decode_node.cli import main

main()
