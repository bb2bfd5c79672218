from bigknn.cli import main

main()
