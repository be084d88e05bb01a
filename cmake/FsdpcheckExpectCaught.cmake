# FsdpcheckExpectCaught.cmake — one fault-catalogue test of
# fsdpcheck_add_gate(... FAULTS), run in script mode:
#
#   cmake -DMPIRUN="mpiexec;-n;4" -DFSDPCHECK=/usr/bin/fsdpcheck -DFAULT=no_divide
#         [-DSEED=1] [-DPOSTFLAGS=...] -P FsdpcheckExpectCaught.cmake
#
# Runs the default sweep of the reference with FAULT injected and passes only
# if the sweep fails (exit 1) and names the property that caught it
# ("caught by P<k>"), that property being the one the fault catalogue expects
# ("the fault catalogue expects P<k> for FAULT") where the sweep says so.
foreach(v MPIRUN FSDPCHECK FAULT)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "FsdpcheckExpectCaught.cmake: -D${v}=... is required")
  endif()
endforeach()
if(NOT DEFINED SEED)
  set(SEED 1)
endif()
execute_process(COMMAND ${MPIRUN} ${FSDPCHECK} ${POSTFLAGS} sweep --inject ${FAULT} --seed ${SEED} --quiet
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
string(REGEX MATCH "(^|\n)caught by P([0-9]+)" caught "${out}")
set(by "${CMAKE_MATCH_2}")
string(REGEX MATCH "the fault catalogue expects P([0-9]+)" expects "${out}")
set(want "${CMAKE_MATCH_1}")
if(NOT rc STREQUAL "1" OR NOT caught OR (want AND NOT by STREQUAL want))
  if(want)
    set(why "want exit 1 and 'caught by P${want}'")
  else()
    set(why "want exit 1 and a 'caught by P<k>' line")
  endif()
  message("${out}")
  if(by)
    set(by "caught by P${by}")
  else()
    set(by "no 'caught by' line")
  endif()
  message(FATAL_ERROR "FAIL: fault ${FAULT}: exit ${rc}, ${by} (${why})")
endif()
string(REGEX MATCHALL "(caught by|minimal failing case|reproduce)[^\n]*" lines "${out}")
foreach(l ${lines})
  message("${l}")
endforeach()
message("ok: ${FAULT} caught by P${by}")
