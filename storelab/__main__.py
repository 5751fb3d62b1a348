from storelab.cli import main

main()
