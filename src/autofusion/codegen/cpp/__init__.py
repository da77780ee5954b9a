"""The C++ backend for CPUs: generated source in, shared libraries loaded with ctypes out (`build.py`)."""
