# One ctest entry per harness mode, over the real registry (CPU kernels on this machine).
# test and grad run as shards of the catalogue (--shard K/N splits by op name), so ctest -j runs
# them side by side: grad alone took 1,354 s under ASan+UBSan on the 2-core CI machine
# (2026-12-02). COST starts them before the short tests.
set(OPFORGE_HARNESS_SHARDS 4)
math(EXPR _last_shard "${OPFORGE_HARNESS_SHARDS} - 1")
foreach(mode test grad)
  foreach(k RANGE ${_last_shard})
    add_test(NAME harness.${mode}.${k}
             COMMAND opforge_cli check --mode ${mode} --shard ${k}/${OPFORGE_HARNESS_SHARDS})
    set_tests_properties(harness.${mode}.${k} PROPERTIES TIMEOUT 1800 COST 1000)
  endforeach()
endforeach()
# A short fuzz pass (Note [fuzz derivation]): 8 draws per op at a fixed seed, the CPU kernels in
# test and grad mode, and the reference backwards against finite differences on the draws.
# About 5 s each on the 2-core development machine (Release).
add_test(NAME harness.fuzz.cpu COMMAND opforge_cli check --fuzz 8 --seed 20261204 --backend cpu)
add_test(NAME harness.fuzz.reference COMMAND opforge_cli check --fuzz 8 --seed 20261204 --backend reference --mode grad)
set_tests_properties(harness.fuzz.cpu harness.fuzz.reference PROPERTIES TIMEOUT 900)
add_test(NAME harness.perf COMMAND opforge_cli bench --group small --samples 3)
add_test(NAME harness.support COMMAND opforge_cli support --out ${CMAKE_CURRENT_BINARY_DIR}/ops.md)
set_tests_properties(harness.perf harness.support PROPERTIES TIMEOUT 900)
# A shard that is not K/N with K < N is refused with one line naming the flag.
add_test(NAME cli.shard_out_of_range COMMAND opforge_cli check --mode test --shard 4/4)
set_tests_properties(cli.shard_out_of_range PROPERTIES
  PASS_REGULAR_EXPRESSION "argument '--shard': expected K/N with 0 <= K < N <= 1000, got '4/4'")

# The CLI end to end: a call on the example inputs, and bad input giving one clear line.
set(OPFORGE_EXAMPLES ${PROJECT_SOURCE_DIR}/data/examples)
add_test(NAME cli.call COMMAND opforge_cli call rms_norm x=${OPFORGE_EXAMPLES}/x.npy
  w=${OPFORGE_EXAMPLES}/w.npy eps=1e-6 --out y=${CMAKE_CURRENT_BINARY_DIR}/cli_y.npy --explain)
set_tests_properties(cli.call PROPERTIES PASS_REGULAR_EXPRESSION "rms_norm: ran cpu on cpu")
add_test(NAME cli.call_rejects_bad_shape COMMAND opforge_cli call rms_norm x=${OPFORGE_EXAMPLES}/x.npy
  w=${OPFORGE_EXAMPLES}/x.npy)
set_tests_properties(cli.call_rejects_bad_shape PROPERTIES WILL_FAIL TRUE)
add_test(NAME cli.call_bad_shape_message COMMAND opforge_cli call rms_norm x=${OPFORGE_EXAMPLES}/x.npy
  w=${OPFORGE_EXAMPLES}/x.npy)
set_tests_properties(cli.call_bad_shape_message PROPERTIES
  PASS_REGULAR_EXPRESSION "rms_norm: argument 'w': expected shape \\[64\\], got \\[4, 64\\]")
add_test(NAME cli.policy_typo COMMAND opforge_cli list --ops -rms_nrom)
set_tests_properties(cli.policy_typo PROPERTIES WILL_FAIL TRUE)
add_test(NAME cli.policy_typo_message COMMAND opforge_cli list --ops -rms_nrom)
set_tests_properties(cli.policy_typo_message PROPERTIES PASS_REGULAR_EXPRESSION "unknown op 'rms_nrom'; valid ops: ")
add_test(NAME cli.list_json COMMAND opforge_cli list --json)
set_tests_properties(cli.list_json PROPERTIES PASS_REGULAR_EXPRESSION "\"selected\": true")
add_test(NAME cli.env_policy COMMAND opforge_cli explain rms_norm)
set_tests_properties(cli.env_policy PROPERTIES ENVIRONMENT "OPFORGE_OPS=-rms_norm"
  PASS_REGULAR_EXPRESSION "rule: '-rms_norm' \\(from OPFORGE_OPS\\)")
add_test(NAME cli.case_typo_message COMMAND opforge_cli bench rms_norm --case t1024xh40 --no-reference)
set_tests_properties(cli.case_typo_message PROPERTIES WILL_FAIL FALSE
  PASS_REGULAR_EXPRESSION "unknown case 't1024xh40'; valid: .*t1024xh4096")
