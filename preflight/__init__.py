"""``slime-check``: does an installed SliMe fit the cluster around it? One line per check, with the fix.

Read-only against the live cluster (the operator's kubeconfig, or the in-cluster identity the
chart's ``helm test`` hook gives it), except for two server-side dry runs that go through the
API server's admission chain. Part of the product: it ships in the image and may import
``common/`` and the services' pure modules; neither service imports it.
"""
