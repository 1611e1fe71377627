"""The kit the tests, the demo and the benchmark share (the services never import it).

- :mod:`testbed.world`: seed a Slinky + CAPM3 + CAPI world into an API server, and read it back;
- :mod:`testbed.reviews`: the AdmissionReview requests kube-apiserver sends to our webhooks;
- :mod:`testbed.serve`: run a webhook service in a thread over TLS on 127.0.0.1 and call it;
- :mod:`testbed.pki`: a dev PKI (CA bundle plus a rotatable serving pair);
- :mod:`testbed.wait`: poll until a condition holds;
- :mod:`testbed.helm`: find or fetch a ``helm`` binary.
"""
