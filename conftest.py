"""The fixtures every test tree of the checkout shares (tests/ and kit/tests): the kit's pytest plugin."""

import sys

# The suite starts the services, the CLIs and the demo as Python processes hundreds of times, and each
# would compile the product and the kit from source again where PYTHONDONTWRITEBYTECODE is set (it was on
# the machines measured here: about 12 s of the fast loop). This process writes the bytecode caches
# (``__pycache__/``, ignored by git) as it imports; the processes it starts read them.
sys.dont_write_bytecode = False

pytest_plugins = ["testbed.scenarios.fixtures"]
