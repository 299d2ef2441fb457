"""The PJRT C API's binary interface, as cffi declarations.

The layouts follow XLA's `xla/pjrt/c/pjrt_c_api.h` at PJRT_API_MAJOR 0, PJRT_API_MINOR 108
(transcribed by hand; only the argument structs of the functions xlapy implements are
declared, the other slots of the function table get a generic signature). Every argument
struct begins with `struct_size` and `extension_start`; a caller built against a newer minor
version passes larger structs, and xlapy reads and writes only the fields declared here.
`SLOTS` is the order of the function pointers in `PJRT_Api`: a slot's position is ABI, so
new names only ever go at the end.

xlapy defines the object types the header leaves opaque (PJRT_Buffer, PJRT_Event, ...) as
structs holding an `index`, the key of the Python object behind the handle; PJRT_Memory
and PJRT_Error begin with the function tables the header gives them. Executables,
buffers, events and memories also carry the values the native fast paths read
(xlapy/pjrt/native.py).
"""

from __future__ import annotations

import cffi

PJRT_API_MAJOR = 0
PJRT_API_MINOR = 108

SLOTS = """
Error_Destroy Error_Message Error_GetCode
Plugin_Initialize Plugin_Attributes
Event_Destroy Event_IsReady Event_Error Event_Await Event_OnReady
Client_Create Client_Destroy Client_PlatformName Client_ProcessIndex Client_PlatformVersion
Client_Devices Client_AddressableDevices Client_LookupDevice Client_LookupAddressableDevice
Client_AddressableMemories Client_Compile Client_DefaultDeviceAssignment
Client_BufferFromHostBuffer
DeviceDescription_Id DeviceDescription_ProcessIndex DeviceDescription_Attributes
DeviceDescription_Kind DeviceDescription_DebugString DeviceDescription_ToString
Device_GetDescription Device_IsAddressable Device_LocalHardwareId Device_AddressableMemories
Device_DefaultMemory Device_MemoryStats
Memory_Id Memory_Kind Memory_DebugString Memory_ToString Memory_AddressableByDevices
Executable_Destroy Executable_Name Executable_NumReplicas Executable_NumPartitions
Executable_NumOutputs Executable_SizeOfGeneratedCodeInBytes Executable_GetCostAnalysis
Executable_OutputMemoryKinds Executable_OptimizedProgram Executable_Serialize
LoadedExecutable_Destroy LoadedExecutable_GetExecutable LoadedExecutable_AddressableDevices
LoadedExecutable_Delete LoadedExecutable_IsDeleted LoadedExecutable_Execute
Executable_DeserializeAndLoad LoadedExecutable_Fingerprint
Buffer_Destroy Buffer_ElementType Buffer_Dimensions Buffer_UnpaddedDimensions
Buffer_DynamicDimensionIndices Buffer_GetMemoryLayout Buffer_OnDeviceSizeInBytes Buffer_Device
Buffer_Memory Buffer_Delete Buffer_IsDeleted Buffer_CopyToDevice Buffer_ToHostBuffer
Buffer_IsOnCpu Buffer_ReadyEvent Buffer_UnsafePointer Buffer_IncreaseExternalReferenceCount
Buffer_DecreaseExternalReferenceCount Buffer_OpaqueDeviceMemoryDataPointer
CopyToDeviceStream_Destroy CopyToDeviceStream_AddChunk CopyToDeviceStream_TotalBytes
CopyToDeviceStream_GranuleSize CopyToDeviceStream_CurrentBytes
TopologyDescription_Create TopologyDescription_Destroy TopologyDescription_PlatformName
TopologyDescription_PlatformVersion TopologyDescription_GetDeviceDescriptions
TopologyDescription_Serialize TopologyDescription_Attributes
Compile
Executable_OutputElementTypes Executable_OutputDimensions
Buffer_CopyToMemory
Client_CreateViewOfDeviceBuffer
Executable_Fingerprint
Client_TopologyDescription
Executable_GetCompiledMemoryStats
Memory_Kind_Id
ExecuteContext_Create ExecuteContext_Destroy Buffer_CopyRawToHost
AsyncHostToDeviceTransferManager_Destroy AsyncHostToDeviceTransferManager_TransferData
Client_CreateBuffersForAsyncHostToDevice AsyncHostToDeviceTransferManager_RetrieveBuffer
AsyncHostToDeviceTransferManager_Device AsyncHostToDeviceTransferManager_BufferCount
AsyncHostToDeviceTransferManager_BufferSize AsyncHostToDeviceTransferManager_SetBufferError
AsyncHostToDeviceTransferManager_AddMetadata Client_DmaMap Client_DmaUnmap
Client_CreateUninitializedBuffer Client_UpdateGlobalProcessInfo
TopologyDescription_Deserialize Client_CreateAliasBuffer Client_FulfillAliasBuffer
LoadedExecutable_GetDeviceAssignment Client_CreateErrorBuffer
AsyncHostToDeviceTransferManager_TransferLiteral Buffer_CopyRawToHostFuture
Device_PoisonExecution Device_CreateAsyncTrackingEvent AsyncTrackingEvent_Destroy
Executable_GetCompileOptions Buffer_DonateWithControlDependency Event_Create Event_Set
Device_GetAttributes
Client_Load LoadedExecutable_AddressableDeviceLogicalIds Buffer_Bitcast
Error_ForEachPayload TopologyDescription_Fingerprint Executable_ParameterMemoryKinds
Device_ClearMemoryStats
""".split()  # noqa: SIM905 (one name per slot, in table order)

CDEF = """
typedef struct PJRT_Extension_Base PJRT_Extension_Base;
typedef struct PJRT_Client { int64_t index; } PJRT_Client;
typedef struct PJRT_Device { int64_t index; } PJRT_Device;
typedef struct PJRT_DeviceDescription { int64_t index; } PJRT_DeviceDescription;
typedef struct PJRT_TopologyDescription { int64_t index; } PJRT_TopologyDescription;
typedef struct PJRT_Executable { int64_t index;
  int64_t num_replicas; int64_t num_partitions; int64_t num_outputs; } PJRT_Executable;
typedef struct PJRT_LoadedExecutable { int64_t index;
  int64_t num_replicas; int64_t num_partitions; int64_t num_outputs;
  void* fast; int64_t fast_calls; } PJRT_LoadedExecutable;
typedef struct PJRT_Buffer { int64_t index; PJRT_Device* device; void* memory;
  void* data; int64_t nbytes; int64_t plain; int64_t readers; int64_t shape_key;
  int64_t native; int64_t* counters; } PJRT_Buffer;
typedef struct PJRT_Event { int64_t index; int64_t completed; } PJRT_Event;
typedef struct PJRT_ExecuteContext { int64_t index; } PJRT_ExecuteContext;
typedef struct PJRT_SerializedExecutable PJRT_SerializedExecutable;
typedef struct PJRT_SerializedCompileOptions PJRT_SerializedCompileOptions;

typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  int major_version; int minor_version; } PJRT_Api_Version;

/* Errors: an xlapy error is a struct whose first field is the function table (minor 100+
   callers may use it instead of the PJRT_Error_* functions). */
typedef struct PJRT_Error PJRT_Error;
typedef void (*PJRT_Error_PayloadVisitor)(const char* key, size_t key_size,
    const char* value, size_t value_size, void* user_arg);
typedef struct {
  size_t struct_size; size_t instance_size; PJRT_Extension_Base* extension_start;
  void (*destroy)(PJRT_Error* error);
  void (*message)(const PJRT_Error* error, const char** message, size_t* message_size);
  int (*get_code)(const PJRT_Error* error);
  void (*for_each_payload)(const PJRT_Error* error, PJRT_Error_PayloadVisitor visitor,
                           void* user_arg);
} PJRT_Error_FunctionTable;
struct PJRT_Error { const PJRT_Error_FunctionTable* vtable; int code; const char* message;
  size_t message_size; int64_t index; };

typedef struct PJRT_Memory PJRT_Memory;
typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start; size_t instance_struct_size;
  void* (*get_user_data)(PJRT_Memory* memory, const void* key);
  void (*set_user_data)(PJRT_Memory* memory, const void* key, void* data, void (*dtor)(void*));
} PJRT_Memory_FunctionTable;
struct PJRT_Memory { const PJRT_Memory_FunctionTable* vtable; int64_t index;
  const char* kind; size_t kind_size; const void* user_keys[4]; void* user_data[4]; };

/* Serialized bytes handed out, freed by the caller through a deleter. */
typedef struct { int64_t index; } XlapyHandle;

typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Error* error; } PJRT_Error_Destroy_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  const PJRT_Error* error; const char* message; size_t message_size; } PJRT_Error_Message_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  const PJRT_Error* error; int code; } PJRT_Error_GetCode_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  const PJRT_Error* error; PJRT_Error_PayloadVisitor visitor; void* user_arg;
} PJRT_Error_ForEachPayload_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  const char* name; size_t name_size; int type;
  union { const char* string_value; int64_t int64_value; const int64_t* int64_array_value;
          float float_value; bool bool_value; };
  size_t value_size;
} PJRT_NamedValue;

typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start; }
  PJRT_Plugin_Initialize_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  const PJRT_NamedValue* attributes; size_t num_attributes; } PJRT_Plugin_Attributes_Args;

typedef void (*PJRT_Event_OnReadyCallback)(PJRT_Error* error, void* user_arg);
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Event* event; } PJRT_Event_Destroy_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Event* event; bool is_ready; } PJRT_Event_IsReady_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Event* event; } PJRT_Event_Error_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Event* event; } PJRT_Event_Await_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Event* event; PJRT_Event_OnReadyCallback callback; void* user_arg;
} PJRT_Event_OnReady_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Event* event; } PJRT_Event_Create_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Event* event; int error_code; const char* error_message; size_t error_message_size;
} PJRT_Event_Set_Args;

typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  const PJRT_NamedValue* create_options; size_t num_options;
  void* kv_get_callback; void* kv_get_user_arg; void* kv_put_callback; void* kv_put_user_arg;
  PJRT_Client* client; } PJRT_Client_Create_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Client* client; } PJRT_Client_Destroy_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Client* client; const char* platform_name; size_t platform_name_size;
} PJRT_Client_PlatformName_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Client* client; int process_index; } PJRT_Client_ProcessIndex_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Client* client; const char* platform_version; size_t platform_version_size;
} PJRT_Client_PlatformVersion_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Client* client; PJRT_Device* const* devices; size_t num_devices;
} PJRT_Client_Devices_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Client* client; PJRT_Device* const* addressable_devices;
  size_t num_addressable_devices; } PJRT_Client_AddressableDevices_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Client* client; int id; PJRT_Device* device; } PJRT_Client_LookupDevice_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Client* client; int local_hardware_id; PJRT_Device* addressable_device;
} PJRT_Client_LookupAddressableDevice_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Client* client; PJRT_Memory* const* addressable_memories;
  size_t num_addressable_memories; } PJRT_Client_AddressableMemories_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  char* code; size_t code_size; const char* format; size_t format_size; } PJRT_Program;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Client* client; const PJRT_Program* program; const char* compile_options;
  size_t compile_options_size; PJRT_LoadedExecutable* executable;
} PJRT_Client_Compile_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Client* client; PJRT_Executable* executable; const char* compile_options;
  size_t compile_options_size; PJRT_LoadedExecutable* loaded_executable;
} PJRT_Client_Load_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Client* client; int num_replicas; int num_partitions; size_t default_assignment_size;
  int* default_assignment; } PJRT_Client_DefaultDeviceAssignment_Args;

typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  const int64_t* minor_to_major; size_t minor_to_major_size; const int64_t* tile_dims;
  const size_t* tile_dim_sizes; size_t num_tiles; } PJRT_Buffer_MemoryLayout_Tiled;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  const int64_t* byte_strides; size_t num_byte_strides; } PJRT_Buffer_MemoryLayout_Strides;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  union { PJRT_Buffer_MemoryLayout_Tiled tiled; PJRT_Buffer_MemoryLayout_Strides strides; };
  int type; } PJRT_Buffer_MemoryLayout;

typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Client* client; const void* data; int type; const int64_t* dims; size_t num_dims;
  const int64_t* byte_strides; size_t num_byte_strides; int host_buffer_semantics;
  PJRT_Device* device; PJRT_Memory* memory; PJRT_Buffer_MemoryLayout* device_layout;
  PJRT_Event* done_with_host_buffer; PJRT_Buffer* buffer;
} PJRT_Client_BufferFromHostBuffer_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Client* client; const int64_t* shape_dims; size_t shape_num_dims;
  int shape_element_type; PJRT_Buffer_MemoryLayout* shape_layout; PJRT_Device* device;
  PJRT_Memory* memory; PJRT_Buffer* buffer; } PJRT_Client_CreateUninitializedBuffer_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Client* client; int error_code; const char* error_message; size_t error_message_size;
  const int64_t* shape_dims; size_t shape_num_dims; int shape_element_type;
  PJRT_Buffer_MemoryLayout* shape_layout; PJRT_Memory* memory; PJRT_Buffer* buffer;
} PJRT_Client_CreateErrorBuffer_Args;

typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description; int id; } PJRT_DeviceDescription_Id_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description; int process_index;
} PJRT_DeviceDescription_ProcessIndex_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description; size_t num_attributes;
  const PJRT_NamedValue* attributes; } PJRT_DeviceDescription_Attributes_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description; const char* text; size_t text_size;
} PJRT_DeviceDescription_Text_Args;

typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Device* device; PJRT_DeviceDescription* device_description;
} PJRT_Device_GetDescription_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Device* device; bool is_addressable; } PJRT_Device_IsAddressable_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Device* device; int local_hardware_id; } PJRT_Device_LocalHardwareId_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Device* device; PJRT_Memory* const* memories; size_t num_memories;
} PJRT_Device_AddressableMemories_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Device* device; PJRT_Memory* memory; } PJRT_Device_DefaultMemory_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Device* device;
  int64_t bytes_in_use;
  int64_t peak_bytes_in_use; bool peak_bytes_in_use_is_set;
  int64_t num_allocs; bool num_allocs_is_set;
  int64_t largest_alloc_size; bool largest_alloc_size_is_set;
  int64_t bytes_limit; bool bytes_limit_is_set;
  int64_t bytes_reserved; bool bytes_reserved_is_set;
  int64_t peak_bytes_reserved; bool peak_bytes_reserved_is_set;
  int64_t bytes_reservable_limit; bool bytes_reservable_limit_is_set;
  int64_t largest_free_block_bytes; bool largest_free_block_bytes_is_set;
  int64_t pool_bytes; bool pool_bytes_is_set;
  int64_t peak_pool_bytes; bool peak_pool_bytes_is_set;
} PJRT_Device_MemoryStats_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Device* device; } PJRT_Device_ClearMemoryStats_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Device* device; const PJRT_NamedValue* attributes; size_t num_attributes;
  void* device_attributes; void (*attributes_deleter)(void* device_attributes);
} PJRT_Device_GetAttributes_Args;

typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Memory* memory; int id; } PJRT_Memory_Id_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Memory* memory; const char* text; size_t text_size; } PJRT_Memory_Text_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Memory* memory; int kind_id; } PJRT_Memory_Kind_Id_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Memory* memory; PJRT_Device* const* devices; size_t num_devices;
} PJRT_Memory_AddressableByDevices_Args;

typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable; } PJRT_Executable_Destroy_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable; } PJRT_LoadedExecutable_Destroy_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* loaded_executable; PJRT_Executable* executable;
} PJRT_LoadedExecutable_GetExecutable_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable; const char* text; size_t text_size;
} PJRT_Executable_Text_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable; size_t count; } PJRT_Executable_Count_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable; int64_t size_in_bytes;
} PJRT_Executable_SizeOfGeneratedCodeInBytes_Args;
typedef struct { int replica; int partition; } PJRT_LogicalDeviceIds;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable; PJRT_Device* const* addressable_devices;
  size_t num_addressable_devices; } PJRT_LoadedExecutable_AddressableDevices_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable; PJRT_LogicalDeviceIds* addressable_device_logical_ids;
  size_t num_addressable_device_logical_ids;
} PJRT_LoadedExecutable_AddressableDeviceLogicalIds_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable; PJRT_Program* program; } PJRT_Executable_OptimizedProgram_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable; } PJRT_LoadedExecutable_Delete_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable; bool is_deleted; } PJRT_LoadedExecutable_IsDeleted_Args;
typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  void** send_callbacks; void** recv_callbacks; size_t num_send_ops; size_t num_recv_ops;
  int launch_id; const int64_t* non_donatable_input_indices;
  size_t num_non_donatable_input_indices; PJRT_ExecuteContext* context;
} PJRT_ExecuteOptions;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable; PJRT_ExecuteOptions* options;
  PJRT_Buffer* const* const* argument_lists; size_t num_devices; size_t num_args;
  PJRT_Buffer** const* output_lists; PJRT_Event** device_complete_events;
  PJRT_Device* execute_device; } PJRT_LoadedExecutable_Execute_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable; const char* executable_fingerprint;
  size_t executable_fingerprint_size; } PJRT_Executable_Fingerprint_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable; const char* executable_fingerprint;
  size_t executable_fingerprint_size; } PJRT_LoadedExecutable_Fingerprint_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable; size_t num_properties; const PJRT_NamedValue* properties;
} PJRT_Executable_GetCostAnalysis_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  int64_t generated_code_size_in_bytes; int64_t argument_size_in_bytes;
  int64_t output_size_in_bytes; int64_t alias_size_in_bytes; int64_t temp_size_in_bytes;
  int64_t host_generated_code_size_in_bytes; int64_t host_argument_size_in_bytes;
  int64_t host_output_size_in_bytes; int64_t host_alias_size_in_bytes;
  int64_t host_temp_size_in_bytes; int64_t peak_memory_in_bytes;
  int64_t total_size_in_bytes; int64_t total_allocation_bytes;
  int64_t indefinite_allocations; int64_t peak_unpadded_heap_bytes;
} PJRT_Executable_GetCompiledMemoryStats_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable; int* output_types; size_t num_output_types;
} PJRT_Executable_OutputElementTypes_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable; size_t num_outputs; const int64_t* dims;
  const size_t* dim_sizes; } PJRT_Executable_OutputDimensions_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable; size_t num_kinds; const char* const* memory_kinds;
  const size_t* memory_kind_sizes; } PJRT_Executable_MemoryKinds_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  const PJRT_Executable* executable; const char* serialized_bytes;
  size_t serialized_bytes_size; void* serialized_executable;
  void (*serialized_executable_deleter)(void* exec); } PJRT_Executable_Serialize_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable; const char* serialized_bytes;
  size_t serialized_bytes_size; void* serialized_device_assignment;
  void (*serialized_device_assignment_deleter)(void* da);
} PJRT_LoadedExecutable_GetDeviceAssignment_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Client* client; const char* serialized_executable; size_t serialized_executable_size;
  PJRT_LoadedExecutable* loaded_executable;
  const char* overridden_serialized_compile_options;
  size_t overridden_serialized_compile_options_size;
} PJRT_Executable_DeserializeAndLoad_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable; const char* serialized_bytes; size_t serialized_bytes_size;
  void* serialized_compile_options; void (*serialized_compile_options_deleter)(void* options);
} PJRT_Executable_GetCompileOptions_Args;

typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer; } PJRT_Buffer_Only_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer; int type; } PJRT_Buffer_ElementType_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer; const int64_t* dims; size_t num_dims; } PJRT_Buffer_Dimensions_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer; const size_t* dynamic_dim_indices; size_t num_dynamic_dims;
} PJRT_Buffer_DynamicDimensionIndices_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer; PJRT_Buffer_MemoryLayout layout; } PJRT_Buffer_GetMemoryLayout_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Buffer* src; PJRT_Buffer_MemoryLayout* host_layout; void* dst; size_t dst_size;
  PJRT_Event* event; } PJRT_Buffer_ToHostBuffer_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer; size_t on_device_size_in_bytes;
} PJRT_Buffer_OnDeviceSizeInBytes_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer; bool flag; } PJRT_Buffer_Flag_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer; PJRT_Device* device; } PJRT_Buffer_Device_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer; PJRT_Memory* memory; } PJRT_Buffer_Memory_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer; PJRT_Event* event; } PJRT_Buffer_ReadyEvent_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer; uintptr_t buffer_pointer; } PJRT_Buffer_UnsafePointer_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer; void* device_memory_ptr;
} PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer; PJRT_Device* dst_device; PJRT_Buffer* dst_buffer;
} PJRT_Buffer_CopyToDevice_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer; PJRT_Memory* dst_memory; PJRT_Buffer* dst_buffer;
} PJRT_Buffer_CopyToMemory_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer; void* dst; int64_t offset; int64_t transfer_size; PJRT_Event* event;
} PJRT_Buffer_CopyRawToHost_Args;

typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_ExecuteContext* context; } PJRT_ExecuteContext_Create_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_ExecuteContext* context; } PJRT_ExecuteContext_Destroy_Args;

typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Client* client; PJRT_TopologyDescription* topology;
} PJRT_Client_TopologyDescription_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_TopologyDescription* topology; } PJRT_TopologyDescription_Destroy_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_TopologyDescription* topology; const char* text; size_t text_size;
} PJRT_TopologyDescription_Text_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_TopologyDescription* topology; PJRT_DeviceDescription* const* descriptions;
  size_t num_descriptions; } PJRT_TopologyDescription_GetDeviceDescriptions_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_TopologyDescription* topology; const PJRT_NamedValue* attributes;
  size_t num_attributes; } PJRT_TopologyDescription_Attributes_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_TopologyDescription* topology; const char* serialized_bytes;
  size_t serialized_bytes_size; void* serialized_topology;
  void (*serialized_topology_deleter)(void* serialized_topology);
} PJRT_TopologyDescription_Serialize_Args;
typedef struct { size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_TopologyDescription* topology; uint64_t fingerprint;
} PJRT_TopologyDescription_Fingerprint_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Api_Version pjrt_api_version;
  void* slots[NUM_SLOTS];
} PJRT_Api;
""".replace("NUM_SLOTS", str(len(SLOTS)))

ffi = cffi.FFI()
ffi.cdef(CDEF)


def struct_size(ctype: str) -> int:
    """PJRT's size of an argument struct: the end of its last field, without the tail
    padding `sizeof` adds (the header's PJRT_STRUCT_SIZE; JAX passes e.g. 25 for
    PJRT_Device_IsAddressable_Args, whose last field is a bool at offset 24)."""
    return max(ffi.offsetof(ctype, f) + ffi.sizeof(t.type) for f, t in ffi.typeof(ctype).fields)
