"""Each component the tests run, once: how it is built or fetched, started, stopped and known to be ready."""
