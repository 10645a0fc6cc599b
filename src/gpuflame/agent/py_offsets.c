/* Print the CPython struct offsets the agent needs, as one JSON object.
 *
 * Built against one Python version's own (internal) headers:
 *   cc -DPy_BUILD_CORE -I include/python3.X -I include/python3.X/internal py_offsets.c
 * py_offsets.py holds the output for each supported version; the tests rebuild
 * it from every installed version's headers and compare.
 */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#include "pycore_runtime.h"
#include "pycore_interp.h"
#if PY_VERSION_HEX >= 0x030B0000
#include "pycore_frame.h"
#include "pycore_code.h"

#else
#include "frameobject.h"
#endif

#define D(name, field) printf("    \"%s\": %ld,\n", name, (long)offsetof(_Py_DebugOffsets, field))
#define F(name, expr) printf("  \"%s\": %ld,\n", name, (long)(expr))

int main(void) {
    printf("{\n");
    F("runtime_interp_head", offsetof(_PyRuntimeState, interpreters.head));
#if PY_VERSION_HEX >= 0x030B0000
    F("interp_threads_head", offsetof(PyInterpreterState, threads.head));
    F("tstate_native_thread_id", offsetof(PyThreadState, native_thread_id));
#else
    F("interp_threads_head", offsetof(PyInterpreterState, tstate_head));
    F("tstate_native_thread_id", -1);
#endif
    F("tstate_next", offsetof(PyThreadState, next));
    F("tstate_thread_id", offsetof(PyThreadState, thread_id));
#if PY_VERSION_HEX >= 0x030D0000
    F("tstate_cframe", -1);
    F("cframe_current_frame", -1);
    F("tstate_frame", offsetof(PyThreadState, current_frame));
    F("frame_code", offsetof(_PyInterpreterFrame, f_executable));
    F("frame_instr", offsetof(_PyInterpreterFrame, instr_ptr));
    F("frame_instr_size", sizeof(((_PyInterpreterFrame *)0)->instr_ptr));
#elif PY_VERSION_HEX >= 0x030B0000
    F("tstate_cframe", offsetof(PyThreadState, cframe));
    F("cframe_current_frame", offsetof(_PyCFrame, current_frame));
    F("tstate_frame", -1);
    F("frame_code", offsetof(_PyInterpreterFrame, f_code));
    F("frame_instr", offsetof(_PyInterpreterFrame, prev_instr));
    F("frame_instr_size", sizeof(((_PyInterpreterFrame *)0)->prev_instr));
#else
    F("tstate_cframe", -1);
    F("cframe_current_frame", -1);
    F("tstate_frame", offsetof(PyThreadState, frame));
    F("frame_code", offsetof(PyFrameObject, f_code));
    F("frame_instr", offsetof(PyFrameObject, f_lasti));
    F("frame_instr_size", sizeof(((PyFrameObject *)0)->f_lasti));
#endif
#if PY_VERSION_HEX >= 0x030B0000
    F("frame_previous", offsetof(_PyInterpreterFrame, previous));
    F("frame_owner", offsetof(_PyInterpreterFrame, owner));
    F("code_qualname", offsetof(PyCodeObject, co_qualname));
    F("code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
#else
    F("frame_previous", offsetof(PyFrameObject, f_back));
    F("frame_owner", -1);
    F("code_qualname", -1);
    F("code_adaptive", -1);
#endif
#if PY_VERSION_HEX >= 0x030E0000
    F("owner_cstack", FRAME_OWNED_BY_INTERPRETER); /* the first owner of a frame that is not Python's */
#elif PY_VERSION_HEX >= 0x030C0000
    F("owner_cstack", FRAME_OWNED_BY_CSTACK);
#else
    F("owner_cstack", -1);
#endif
    F("code_filename", offsetof(PyCodeObject, co_filename));
    F("code_name", offsetof(PyCodeObject, co_name));
    F("code_firstlineno", offsetof(PyCodeObject, co_firstlineno));
    F("code_linetable", offsetof(PyCodeObject, co_linetable));
    F("object_type", offsetof(PyObject, ob_type));
    F("type_name", offsetof(PyTypeObject, tp_name));
    F("bytes_size", offsetof(PyVarObject, ob_size));
    F("bytes_data", offsetof(PyBytesObject, ob_sval));
    F("unicode_state", offsetof(PyASCIIObject, state));
    F("unicode_length", offsetof(PyASCIIObject, length));
    F("unicode_ascii_data", sizeof(PyASCIIObject));
    F("unicode_compact_data", sizeof(PyCompactUnicodeObject));
#if PY_VERSION_HEX >= 0x030D0000
    /* where the process's own _Py_DebugOffsets (at the start of _PyRuntime) publishes each of them */
    printf("  \"debug\": {\n");
    D("runtime_interp_head", runtime_state.interpreters_head);
    D("interp_threads_head", interpreter_state.threads_head);
    D("tstate_next", thread_state.next);
    D("tstate_frame", thread_state.current_frame);
    D("tstate_thread_id", thread_state.thread_id);
    D("tstate_native_thread_id", thread_state.native_thread_id);
    D("frame_previous", interpreter_frame.previous);
    D("frame_code", interpreter_frame.executable);
    D("frame_instr", interpreter_frame.instr_ptr);
    D("frame_owner", interpreter_frame.owner);
    D("code_filename", code_object.filename);
    D("code_name", code_object.name);
    D("code_qualname", code_object.qualname);
    D("code_linetable", code_object.linetable);
    D("code_firstlineno", code_object.firstlineno);
    D("code_adaptive", code_object.co_code_adaptive);
    D("object_type", pyobject.ob_type);
    D("type_name", type_object.tp_name);
    D("bytes_size", bytes_object.ob_size);
    D("bytes_data", bytes_object.ob_sval);
    D("unicode_state", unicode_object.state);
    D("unicode_length", unicode_object.length);
    printf("    \"unicode_ascii_data\": %ld\n  },\n", (long)offsetof(_Py_DebugOffsets, unicode_object.asciiobject_size));
#endif
    printf("  \"version\": \"%d.%d\"\n}\n", PY_MAJOR_VERSION, PY_MINOR_VERSION);
    return 0;
}
