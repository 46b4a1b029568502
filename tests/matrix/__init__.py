"""The catalogue matrix: every registry entry x task x target signal x batch size, run through
the real services and the proxy (``catalogue.py``; the quick slice in
``tests/e2e/test_catalogue_matrix.py``, the whole matrix in ``bench/matrix.py``)."""
