"""How agents cooperate: roles, rewards, fusion, compute allocation, the outer optimizer,
and the channels between agents (private gradients, the shared replay pool, the overhead
controller, the trained ensemble, distillation into one model). Pure math and small
State objects; the programs in :mod:`oresearcher.programs` use them."""
