# mxmoe-dist's ctest cases, included by tests/CMakeLists.txt where the target is built (NCCL
# found). Label cpu: refusals, which happen before any GPU or NCCL call. Label gpu: runs on one
# GPU, through the program's whole communicator path (launcher, pipe, ncclCommInitRank,
# ncclAllReduce, ncclAllGather) on a single rank.
set(MXMOE_DIST_EXPECT ${CMAKE_CURRENT_SOURCE_DIR}/gpu/dist_expect.cmake)
set(MXMOE_DIST_CKPT ${CMAKE_CURRENT_BINARY_DIR}/dist_checkpoint)

# mxmoe_dist_test(NAME LABEL EXIT_STATUS ARGS a b ... [OUT regex] [ERR regex] [REJECT regex]
#                 [ENV VAR=set:value|VAR=unset: ...] [FIXTURE name])
function(mxmoe_dist_test name label rc)
  cmake_parse_arguments(A "" "OUT;ERR;REJECT;FIXTURE" "ARGS;ENV" ${ARGN})
  string(JOIN "::" cmd "$<TARGET_FILE:mxmoe_dist>" ${A_ARGS})
  set(defs "-DCMD=${cmd}" "-DEXPECT_RC=${rc}")
  if(DEFINED A_OUT)
    list(APPEND defs "-DEXPECT_OUT=${A_OUT}")
  endif()
  if(DEFINED A_ERR)
    list(APPEND defs "-DEXPECT_ERR=${A_ERR}")
  endif()
  if(DEFINED A_REJECT)
    list(APPEND defs "-DREJECT_OUT=${A_REJECT}")
  endif()
  add_test(NAME dist.${name} COMMAND ${CMAKE_COMMAND} ${defs} -P ${MXMOE_DIST_EXPECT})
  # An enclosing launcher's variables would make the program a rank of someone else's run.
  set(env RANK=unset: WORLD_SIZE=unset: LOCAL_RANK=unset: OMPI_COMM_WORLD_RANK=unset: OMPI_COMM_WORLD_SIZE=unset:
          OMPI_COMM_WORLD_LOCAL_RANK=unset: NCCL_COMM_ID=unset: ${A_ENV})
  set(timeout 60)
  if(label STREQUAL "gpu")
    set(timeout 300)
  endif()
  set_tests_properties(dist.${name} PROPERTIES LABELS ${label} TIMEOUT ${timeout} ENVIRONMENT_MODIFICATION "${env}")
  if(label STREQUAL "gpu")
    # Like the GPU suite's GTEST_SKIP: a machine without a GPU skips these rather than fails them.
    set_tests_properties(dist.${name} PROPERTIES SKIP_REGULAR_EXPRESSION "no CUDA device is visible")
  endif()
  if(DEFINED A_FIXTURE)
    set_tests_properties(dist.${name} PROPERTIES FIXTURES_REQUIRED ${A_FIXTURE})
  endif()
endfunction()

# A small checkpoint (E 8, K 512, I 256, k 2, two layers over three shards), made by the CLI.
add_test(NAME dist.make_checkpoint
         COMMAND mxmoe_cli make-checkpoint --out ${MXMOE_DIST_CKPT} --experts 8 --hidden 512 --intermediate 256
                 --top-k 2 --layers 2 --shards 3 --seed 5)
set_tests_properties(dist.make_checkpoint PROPERTIES LABELS cpu FIXTURES_SETUP dist_checkpoint)

# ---- refusals (no GPU needed): exit status 1 and one line naming the argument ----
mxmoe_dist_test(help cpu 0 ARGS --help OUT "usage: mxmoe-dist")
mxmoe_dist_test(refuses_unknown_option cpu 1 ARGS --bogus 1 ERR "^mxmoe-dist: invalid argument: unknown option --bogus")
mxmoe_dist_test(refuses_ep_not_dividing_experts cpu 1 ARGS --ep 3
                ERR "^mxmoe-dist: invalid argument: --ep 3 does not divide the layer's 896 experts\n$")
mxmoe_dist_test(refuses_tp_splitting_an_mx_block cpu 1 ARGS --tp 64
                ERR "--tp 64: I / tp = 3072 / 64 is not a multiple of 32")
mxmoe_dist_test(refuses_nproc_not_dividing_slices cpu 1 ARGS --ep 4 --nproc 3
                ERR "--nproc 3 does not divide the 4 slices")
# More ranks than any machine has GPUs: "no CUDA device" here, "only N GPUs" on a GPU machine.
mxmoe_dist_test(refuses_more_ranks_than_gpus cpu 1 ARGS --ep 128 --experts 128
                ERR "no CUDA device is visible|--nproc 128: only [0-9]+ GPUs? (is|are) visible")
mxmoe_dist_test(refuses_layer_without_checkpoint cpu 1 ARGS --layer 2 ERR "--layer needs --checkpoint")
mxmoe_dist_test(refuses_experts_with_checkpoint cpu 1 ARGS --checkpoint ${MXMOE_DIST_CKPT} --experts 8
                ERR "--experts applies to the synthetic layer only")
mxmoe_dist_test(refuses_tokens_with_input cpu 1 ARGS --input x.safetensors --tokens 3
                ERR "--tokens applies to the synthetic input only")
mxmoe_dist_test(refuses_missing_checkpoint cpu 1 ARGS --checkpoint ${CMAKE_CURRENT_BINARY_DIR}/no-such-checkpoint
                ERR "i/o error: .*no-such-checkpoint: cannot open the checkpoint directory")
mxmoe_dist_test(refuses_ep_not_dividing_checkpoint_experts cpu 1 ARGS --checkpoint ${MXMOE_DIST_CKPT} --ep 3
                ERR "--ep 3 does not divide the layer's 8 experts" FIXTURE dist_checkpoint)
mxmoe_dist_test(refuses_external_rank_without_comm_id cpu 1 ARGS --ep 2 ENV RANK=set:1 WORLD_SIZE=set:2
                ERR "started as rank 1 of 2 \\(RANK/WORLD_SIZE\\) but NCCL_COMM_ID is not set")
mxmoe_dist_test(refuses_external_rank_outside_world cpu 1 ARGS --ep 2 ENV RANK=set:2 WORLD_SIZE=set:2
                ERR "RANK = 2 is not below WORLD_SIZE = 2")

# ---- one GPU: single-rank communicators, every slice in turn ----
# One rank, one slice: the all-reduce of a single rank must hand back the unsplit output exactly.
mxmoe_dist_test(single_rank gpu 0 ARGS --nproc 1 --ep 1 --experts 32 --tokens 64 --warmup 1 --repeat 3
                OUT "EP 1 x TP 1 = 1 slice over 1 process.*all-reduced sum vs the unsplit layer: bitwise equal"
                REJECT "FAIL")
# E = 24: every GPU count of 1 to 4, 6 and 8 divides it (the default is --ep over every GPU).
mxmoe_dist_test(defaults_one_rank_per_gpu gpu 0 ARGS --experts 24 --tokens 3 --warmup 1 --repeat 3
                OUT "result: +PASS")
mxmoe_dist_test(one_gpu_ep4 gpu 0
                ARGS --ep 4 --nproc 1 --experts 32 --tokens 200 --routing heavy_hitters --warmup 1 --repeat 3
                OUT "EP 4 x TP 1 = 4 slices over 1 process \\(4 slices each\\).*result: +PASS")
mxmoe_dist_test(one_gpu_tp2 gpu 0 ARGS --tp 2 --nproc 1 --experts 16 --tokens 33 --warmup 1 --repeat 3
                OUT "EP 1 x TP 2 = 2 slices.*result: +PASS")
mxmoe_dist_test(one_gpu_ep2_tp2 gpu 0
                ARGS --ep 2 --tp 2 --nproc 1 --experts 16 --tokens 7 --routing with_invalid --warmup 1 --repeat 3
                OUT "EP 2 x TP 2 = 4 slices.*result: +PASS")
mxmoe_dist_test(checkpoint_ep2_tp2 gpu 0
                ARGS --checkpoint ${MXMOE_DIST_CKPT} --layer 1 --ep 2 --tp 2 --nproc 1 --tokens 19 --warmup 1 --repeat 3
                OUT "checkpoint .*dist_checkpoint, layer 1: E=8 K=512 I=256 k=2.*result: +PASS" FIXTURE dist_checkpoint)
# The external-launcher path (torchrun's variables, NCCL_COMM_ID's bootstrap root on rank 0).
mxmoe_dist_test(external_launcher_one_rank gpu 0 ARGS --ep 2 --experts 16 --tokens 5 --warmup 1 --repeat 3
                ENV RANK=set:0 WORLD_SIZE=set:1 LOCAL_RANK=set:0 NCCL_COMM_ID=set:127.0.0.1:29517
                OUT "ranks from RANK/WORLD_SIZE/LOCAL_RANK.*result: +PASS")
