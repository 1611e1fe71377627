"""The kit's framework: clients, waits, errors, pins, processes and the objects of a site; it knows no component."""
