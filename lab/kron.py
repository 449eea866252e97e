"""python -m lab.kron [--dtype {f,d,bf16}] batch_size factor [factor ...] {check,profile,bench,tune}

The command line of kron's study (check, profile and bench two stacked Kronecker layers; tune the default version):
its code and its --help text live in lab/studies/kron.py; this module only keeps `python -m lab.kron` working.
"""
import sys

from .studies.kron import main

if __name__ == "__main__":
    sys.exit(main())
