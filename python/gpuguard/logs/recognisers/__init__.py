"""One module per failure explain recognises, each a Recogniser subclass; registry.py lists them in order."""
