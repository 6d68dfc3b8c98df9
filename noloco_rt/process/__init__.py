"""Every noloco-rt process's lifetime: started in one order (startup.py), never outliving its
parent (lifetime.py), showing its threads' stacks when stuck (stack_dumps.py)."""
