"""What users run on top of the decode loop: the command line, bench, parity and traces."""
