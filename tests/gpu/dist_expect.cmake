# Runs one mxmoe-dist case for ctest (cmake -P), and checks its exit status and output:
#   -DCMD=prog::arg::arg...   the command, arguments separated by '::'
#   -DEXPECT_RC=N             the exit status it must end with
#   -DEXPECT_OUT=regex        optional: stdout must match
#   -DEXPECT_ERR=regex        optional: stderr must match
#   -DREJECT_OUT=regex        optional: stdout must not match
# It lives with the GPU tests because the runs it checks need a GPU; the refusals it checks
# (label cpu) happen before any device is touched.
foreach(v CMD EXPECT_RC)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "dist_expect.cmake: -D${v}=... is required")
  endif()
endforeach()
string(REPLACE "::" ";" cmd "${CMD}")
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("---- stdout ----\n${out}---- stderr ----\n${err}----------------")
set(failed "")
if(NOT rc STREQUAL "${EXPECT_RC}")
  string(APPEND failed "exit status '${rc}', expected ${EXPECT_RC}\n")
endif()
if(DEFINED EXPECT_OUT AND NOT out MATCHES "${EXPECT_OUT}")
  string(APPEND failed "stdout does not match '${EXPECT_OUT}'\n")
endif()
if(DEFINED EXPECT_ERR AND NOT err MATCHES "${EXPECT_ERR}")
  string(APPEND failed "stderr does not match '${EXPECT_ERR}'\n")
endif()
if(DEFINED REJECT_OUT AND out MATCHES "${REJECT_OUT}")
  string(APPEND failed "stdout matches '${REJECT_OUT}', which it must not\n")
endif()
if(failed)
  message(FATAL_ERROR "${failed}")
endif()
