"""python -m lab.kron [--dtype {f,d}] batch_size factor [factor ...] {check,profile,bench}

The command line of kron's study (check, profile and bench two stacked Kronecker layers): its code and its --help
text live in lab/studies/kron.py; this module only keeps `python -m lab.kron` working.
"""
import sys

from .studies.kron import main

if __name__ == "__main__":
    sys.exit(main())
