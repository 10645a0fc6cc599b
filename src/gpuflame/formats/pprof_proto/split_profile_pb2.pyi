from gpuflame.formats.pprof_proto import profile_pb2 as _profile_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SplitProfile(_message.Message):
    __slots__ = ("sample_type", "sample", "mapping", "location", "function", "string_table", "time_nanos", "duration_nanos", "comment", "default_sample_type", "gpuflame_data")
    SAMPLE_TYPE_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    MAPPING_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    STRING_TABLE_FIELD_NUMBER: _ClassVar[int]
    TIME_NANOS_FIELD_NUMBER: _ClassVar[int]
    DURATION_NANOS_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_SAMPLE_TYPE_FIELD_NUMBER: _ClassVar[int]
    GPUFLAME_DATA_FIELD_NUMBER: _ClassVar[int]
    sample_type: _containers.RepeatedCompositeFieldContainer[_profile_pb2.ValueType]
    sample: _containers.RepeatedScalarFieldContainer[bytes]
    mapping: _containers.RepeatedCompositeFieldContainer[_profile_pb2.Mapping]
    location: _containers.RepeatedScalarFieldContainer[bytes]
    function: _containers.RepeatedScalarFieldContainer[bytes]
    string_table: _containers.RepeatedScalarFieldContainer[bytes]
    time_nanos: int
    duration_nanos: int
    comment: _containers.RepeatedScalarFieldContainer[int]
    default_sample_type: int
    gpuflame_data: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, sample_type: _Optional[_Iterable[_Union[_profile_pb2.ValueType, _Mapping]]] = ..., sample: _Optional[_Iterable[bytes]] = ..., mapping: _Optional[_Iterable[_Union[_profile_pb2.Mapping, _Mapping]]] = ..., location: _Optional[_Iterable[bytes]] = ..., function: _Optional[_Iterable[bytes]] = ..., string_table: _Optional[_Iterable[bytes]] = ..., time_nanos: _Optional[int] = ..., duration_nanos: _Optional[int] = ..., comment: _Optional[_Iterable[int]] = ..., default_sample_type: _Optional[int] = ..., gpuflame_data: _Optional[_Iterable[bytes]] = ...) -> None: ...

class Sample(_message.Message):
    __slots__ = ("location_id", "value", "label")
    LOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    location_id: _containers.RepeatedScalarFieldContainer[int]
    value: _containers.RepeatedScalarFieldContainer[int]
    label: _containers.RepeatedCompositeFieldContainer[Label]
    def __init__(self, location_id: _Optional[_Iterable[int]] = ..., value: _Optional[_Iterable[int]] = ..., label: _Optional[_Iterable[_Union[Label, _Mapping]]] = ...) -> None: ...

class Label(_message.Message):
    __slots__ = ("key", "str", "num", "num_unit")
    KEY_FIELD_NUMBER: _ClassVar[int]
    STR_FIELD_NUMBER: _ClassVar[int]
    NUM_FIELD_NUMBER: _ClassVar[int]
    NUM_UNIT_FIELD_NUMBER: _ClassVar[int]
    key: int
    str: int
    num: int
    num_unit: int
    def __init__(self, key: _Optional[int] = ..., str: _Optional[int] = ..., num: _Optional[int] = ..., num_unit: _Optional[int] = ...) -> None: ...

class Tables(_message.Message):
    __slots__ = ("location", "function")
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    location: _containers.RepeatedCompositeFieldContainer[_profile_pb2.Location]
    function: _containers.RepeatedCompositeFieldContainer[_profile_pb2.Function]
    def __init__(self, location: _Optional[_Iterable[_Union[_profile_pb2.Location, _Mapping]]] = ..., function: _Optional[_Iterable[_Union[_profile_pb2.Function, _Mapping]]] = ...) -> None: ...

class FunctionColumns(_message.Message):
    __slots__ = ("id", "name", "system_name", "filename", "start_line")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_NAME_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    START_LINE_FIELD_NUMBER: _ClassVar[int]
    id: _containers.RepeatedScalarFieldContainer[int]
    name: _containers.RepeatedScalarFieldContainer[int]
    system_name: _containers.RepeatedScalarFieldContainer[int]
    filename: _containers.RepeatedScalarFieldContainer[int]
    start_line: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, id: _Optional[_Iterable[int]] = ..., name: _Optional[_Iterable[int]] = ..., system_name: _Optional[_Iterable[int]] = ..., filename: _Optional[_Iterable[int]] = ..., start_line: _Optional[_Iterable[int]] = ...) -> None: ...

class LocationColumns(_message.Message):
    __slots__ = ("id", "mapping_id", "address", "line")
    ID_FIELD_NUMBER: _ClassVar[int]
    MAPPING_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    id: _containers.RepeatedScalarFieldContainer[int]
    mapping_id: _containers.RepeatedScalarFieldContainer[int]
    address: _containers.RepeatedScalarFieldContainer[int]
    line: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, id: _Optional[_Iterable[int]] = ..., mapping_id: _Optional[_Iterable[int]] = ..., address: _Optional[_Iterable[int]] = ..., line: _Optional[_Iterable[bytes]] = ...) -> None: ...

class LineColumns(_message.Message):
    __slots__ = ("function_id", "line")
    FUNCTION_ID_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    function_id: _containers.RepeatedScalarFieldContainer[int]
    line: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, function_id: _Optional[_Iterable[int]] = ..., line: _Optional[_Iterable[int]] = ...) -> None: ...

class LengthDelimited(_message.Message):
    __slots__ = ("field1", "field2", "field3", "field4", "field5")
    FIELD1_FIELD_NUMBER: _ClassVar[int]
    FIELD2_FIELD_NUMBER: _ClassVar[int]
    FIELD3_FIELD_NUMBER: _ClassVar[int]
    FIELD4_FIELD_NUMBER: _ClassVar[int]
    FIELD5_FIELD_NUMBER: _ClassVar[int]
    field1: _containers.RepeatedScalarFieldContainer[bytes]
    field2: _containers.RepeatedScalarFieldContainer[bytes]
    field3: _containers.RepeatedScalarFieldContainer[bytes]
    field4: _containers.RepeatedScalarFieldContainer[bytes]
    field5: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, field1: _Optional[_Iterable[bytes]] = ..., field2: _Optional[_Iterable[bytes]] = ..., field3: _Optional[_Iterable[bytes]] = ..., field4: _Optional[_Iterable[bytes]] = ..., field5: _Optional[_Iterable[bytes]] = ...) -> None: ...
