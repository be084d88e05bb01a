# FsdpcheckGate.cmake — the fsdpcheck conformance gate as ctest tests in a
# port's own build. find_package(fsdpcheck) includes it.
#
#   fsdpcheck_add_gate(NAME <name> IMPL <target | /path/lib.so | reference>
#                      [WORLD 4] [CASES 300] [SEED 1] [JUNIT <file.xml>]
#                      [FAULTS [<fault>...]] [TIMEOUT <s>] [ENVIRONMENT <VAR=value>...]
#                      [LABELS <label>...])
#
# registers, labelled `gate` and run under FindMPI's MPIEXEC_EXECUTABLE:
#
#   <name>.sweep   mpiexec -n WORLD fsdpcheck sweep --impl IMPL --cases CASES
#                  --seed SEED --junit JUNIT: CASES random configurations of
#                  the port, each checked at every W' = 1..WORLD against the
#                  properties P1-P14 (docs/contract.md §8). Exit 0 pass; on a failure
#                  the test prints the minimal failing case and a one-line
#                  reproducer. JUNIT defaults to <build>/<name>-junit.xml.
#   <name>.fault.<fault>   (FAULTS) the fault catalogue (docs/contract.md §9) against
#                  this very fsdpcheck: `sweep --inject <fault>` runs the
#                  reference with that known bug, and the test passes only if
#                  the sweep fails (exit 1) and says "caught by P<k>" for the
#                  property the catalogue expects. --inject is a build of the
#                  reference, never of the port: these tests prove that the
#                  oracle gating the port is sharp (it catches every known FSDP
#                  bug at this WORLD), next to the sweep proving the port
#                  correct. FAULTS alone registers the whole catalogue;
#                  FAULTS a b c registers those.
#
# IMPL is a SHARED or MODULE library target of this project (the tests then
# depend on its file), a path to a shared library, or `reference`. WORLD
# ranks need WORLD processes (PROCESSORS is set, so `ctest -j` schedules
# them). ENVIRONMENT is added to every test's environment; LABELS are added to
# `gate` (e.g. gpu, for a port that needs a device).
include_guard(GLOBAL)
set(_FSDPCHECK_GATE_DIR ${CMAKE_CURRENT_LIST_DIR})

function(fsdpcheck_add_gate)
  cmake_parse_arguments(PARSE_ARGV 0 G "" "NAME;IMPL;WORLD;CASES;SEED;JUNIT;TIMEOUT" "FAULTS;ENVIRONMENT;LABELS")
  if(G_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "fsdpcheck_add_gate: unknown arguments ${G_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT G_NAME OR NOT G_IMPL)
    message(FATAL_ERROR "fsdpcheck_add_gate: NAME <name> and IMPL <target or .so path> are required")
  endif()
  foreach(v WORLD:4 CASES:300 SEED:1)
    string(REPLACE ":" ";" v ${v})
    list(GET v 0 k)
    list(GET v 1 d)
    if(NOT DEFINED G_${k})
      set(G_${k} ${d})
    elseif(NOT G_${k} MATCHES "^[0-9]+$")
      message(FATAL_ERROR "fsdpcheck_add_gate: ${k} ${G_${k}} is not a number")
    endif()
  endforeach()
  if(NOT G_JUNIT)
    set(G_JUNIT ${CMAKE_CURRENT_BINARY_DIR}/${G_NAME}-junit.xml)
  endif()
  if(NOT MPIEXEC_EXECUTABLE)
    find_package(MPI COMPONENTS C REQUIRED)
  endif()
  if(NOT TARGET fsdpcheck::fsdpcheck)
    message(FATAL_ERROR "fsdpcheck_add_gate: no fsdpcheck::fsdpcheck (find_package(fsdpcheck) first)")
  endif()

  if(TARGET ${G_IMPL})
    get_target_property(type ${G_IMPL} TYPE)
    if(NOT type MATCHES "^(SHARED|MODULE)_LIBRARY$")
      message(FATAL_ERROR "fsdpcheck_add_gate: IMPL ${G_IMPL} is a ${type}; a port is a SHARED or MODULE library")
    endif()
    set(impl $<TARGET_FILE:${G_IMPL}>)
  elseif(G_IMPL STREQUAL "reference" OR G_IMPL STREQUAL "cuda")
    set(impl ${G_IMPL})
  else()
    get_filename_component(impl ${G_IMPL} ABSOLUTE BASE_DIR ${CMAKE_CURRENT_BINARY_DIR})
  endif()

  set(bin $<TARGET_FILE:fsdpcheck::fsdpcheck>)
  set(mpirun ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${G_WORLD} ${MPIEXEC_PREFLAGS})
  set(props PROCESSORS ${G_WORLD})
  if(G_TIMEOUT)
    list(APPEND props TIMEOUT ${G_TIMEOUT})
  endif()

  add_test(NAME ${G_NAME}.sweep
           COMMAND ${mpirun} ${bin} ${MPIEXEC_POSTFLAGS} sweep --impl ${impl} --cases ${G_CASES} --seed ${G_SEED}
                   --junit ${G_JUNIT})
  set(tests ${G_NAME}.sweep)

  if("FAULTS" IN_LIST G_KEYWORDS_MISSING_VALUES)
    set(G_FAULTS ${FSDPCHECK_FAULTS})  # FAULTS alone: the whole catalogue
  endif()
  foreach(f ${G_FAULTS})
    if(FSDPCHECK_FAULTS AND NOT f IN_LIST FSDPCHECK_FAULTS)
      message(FATAL_ERROR "fsdpcheck_add_gate: FAULTS ${f} is not in the fault catalogue (${FSDPCHECK_FAULTS})")
    endif()
    add_test(NAME ${G_NAME}.fault.${f}
             COMMAND ${CMAKE_COMMAND} "-DMPIRUN=${mpirun}" "-DPOSTFLAGS=${MPIEXEC_POSTFLAGS}" -DFSDPCHECK=${bin}
                     -DFAULT=${f} -DSEED=${G_SEED} -P ${_FSDPCHECK_GATE_DIR}/FsdpcheckExpectCaught.cmake)
    list(APPEND tests ${G_NAME}.fault.${f})
  endforeach()
  set_tests_properties(${tests} PROPERTIES ${props})
  set(labels gate ${G_LABELS})
  set_tests_properties(${tests} PROPERTIES LABELS "${labels}")
  if(G_ENVIRONMENT)
    set_tests_properties(${tests} PROPERTIES ENVIRONMENT "${G_ENVIRONMENT}")
  endif()
endfunction()
