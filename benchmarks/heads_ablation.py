import json
import time

import torch

import interp
from interp.look.heads import head_scores
from interp.patching.induction import ablation_check

t0 = time.time()
m = interp.load_model("smollm2-135m-instruct", dtype=torch.float32)
s = head_scores(m, n_tokens=50, n_prompts=32, seed=0)
print("top induction", s.top("induction", 8))
print("top previous", s.top("previous_token", 5))
print("top duplicate", s.top("duplicate_token", 5))
r = ablation_check(m, s, k=5, n_draws=10, n_tokens=50, n_prompts=32, seed=0)
print(json.dumps(r.summary(), indent=1))
print("seconds", round(time.time() - t0, 1))
