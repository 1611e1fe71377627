"""What the scaling webhook knows of Slurm, beneath every Slurm opt-in (safe scale-in, node demand,
machine health); nothing here knows of them.

- :mod:`.endpoint`: where slurmrestd is (the block every opt-in names) and the API versions spoken;
- :mod:`.slurmrestd`: the client (JWT, node states, drain, return to FUTURE, delete, jobs);
- :mod:`.machines`: how a Machine relates to its Slurm node, and a Machine's state (pure);
- :mod:`.reads`: one client per endpoint and one node list per reconcile pass, shared.
"""
