from tandem.prefill_node.cli import main

main()
