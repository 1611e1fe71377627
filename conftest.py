"""The fixtures every test tree of the checkout shares (tests/ and kit/tests): the kit's pytest plugin."""

pytest_plugins = ["testbed.scenarios.fixtures"]
