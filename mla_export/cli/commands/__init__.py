"""The subcommands of `mla-export`: each module has add_parser(subparsers) and run(args)."""
