from kafkasniff.cli import main

main()
