# SPDX-License-Identifier: Apache-2.0
# The conformance kinds implemented so far (SPEC.md §5); ctest runs only these.
# Each issue appends one `list(APPEND ...)` line for its family's kinds, beside its
# tests/conformance/kinds_<family>.cpp.
set(KVSIFT_CONFORMANCE_KINDS)
