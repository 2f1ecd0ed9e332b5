# One ctest entry per harness mode, over the real registry (CPU kernels on this machine).
add_test(NAME harness.test COMMAND opforge_cli check --mode test)
add_test(NAME harness.grad COMMAND opforge_cli check --mode grad)
add_test(NAME harness.perf COMMAND opforge_cli bench --group small --samples 3)
add_test(NAME harness.support COMMAND opforge_cli support --out ${CMAKE_CURRENT_BINARY_DIR}/ops.md)
# The whole catalogue in every dtype: harness.grad ran 616 s under ASan+UBSan on the 2-core CI
# machine (2026-11-26), so the sanitized build needs the larger bound.
set_tests_properties(harness.perf harness.support PROPERTIES TIMEOUT 900)
set_tests_properties(harness.test harness.grad PROPERTIES TIMEOUT 1800)

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
