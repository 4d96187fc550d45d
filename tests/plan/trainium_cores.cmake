# Runs `tern plan` on 32 trn1.32xlarge with degrees counting NeuronCores and
# checks the JSON: 1024 ranks, the layout as given, a positive step time.
execute_process(
  COMMAND ${TERN} plan --system trn1-32xl --chips 512 --model llama3-8b --tp 32 --dp 32 --pp 1
          --zero 1 --global-batch 1024 --micro-batch 1 --json
  OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tern plan failed (${rc}): ${out}")
endif()
string(JSON ranks GET "${out}" ranks)
string(JSON tp GET "${out}" layout tp)
string(JSON dp GET "${out}" layout dp)
string(JSON step GET "${out}" step_ms)
if(NOT ranks EQUAL 1024 OR NOT tp EQUAL 32 OR NOT dp EQUAL 32 OR NOT step GREATER 0)
  message(FATAL_ERROR "unexpected plan: ranks ${ranks} tp ${tp} dp ${dp} step ${step} ms")
endif()
