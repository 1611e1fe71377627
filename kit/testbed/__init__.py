"""The test bed the tests, the demos and the benchmarks share (the product never imports it).

Three layers, each importing only those below it (``tests/test_house.py`` holds them to it), in
the manner of Cluster API's ``test/framework`` and ``test/e2e``:

- :mod:`testbed.framework`: knows no component. One cluster client built from a kubeconfig or
  credentials (:mod:`~testbed.framework.cluster`), one wait (:mod:`~testbed.framework.wait`),
  one exception family (:mod:`~testbed.framework.errors`), one table of pinned versions and
  wait intervals (:mod:`~testbed.framework.pins`); ports, processes, prerequisites, the build
  cache and Go builds, Debian packages, certificates, the session's audits; the objects of a
  Slinky + CAPI + CAPM3 site and how to seed them (:mod:`~testbed.framework.objects`,
  :mod:`~testbed.framework.world`), the AdmissionReviews kube-apiserver sends.
- :mod:`testbed.components`: each component once (build, start/stop, readiness): the product's
  webhooks in this process, the fake slurmrestd, the CAPI stand-in; the real control plane,
  cert-manager, KEDA, Prometheus, Cluster API, CAPM3 and BMO, Slurm, the hosts, their network
  namespaces, the chart's release and pods. No scenario logic.
- :mod:`testbed.scenarios`: compositions: one site builder (:mod:`~testbed.scenarios.site`) and the
  scenarios over it (the whole loop, KEDA, CAPI, cert-manager, the chart stack, the real-Slurm
  sites), the story of the whole loop, the kit's pytest plugin (:mod:`~testbed.scenarios.fixtures`).
"""
