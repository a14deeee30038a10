// SPDX-License-Identifier: Apache-2.0
//
// Makes the extension importable as `vllm_echo._C`. The module itself is
// empty: importing it loads the shared library, whose static initialisers
// register the `torch.ops.vllm_echo` operators.

#include <Python.h>

namespace {

PyModuleDef vllm_echo_c_module = {
    PyModuleDef_HEAD_INIT,
    "_C",                                                       // m_name
    "Compiled operators for vllm_echo, see torch.ops.vllm_echo",  // m_doc
    -1,                                                         // m_size
    nullptr,                                                    // m_methods
    nullptr,                                                    // m_slots
    nullptr,                                                    // m_traverse
    nullptr,                                                    // m_clear
    nullptr,                                                    // m_free
};

}  // namespace

PyMODINIT_FUNC PyInit__C() { return PyModule_Create(&vllm_echo_c_module); }
