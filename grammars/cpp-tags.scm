; hybrid tags query for C++ (conventions in python-tags.scm).

(struct_specifier name: (type_identifier) @definition.class body: (_))
(union_specifier name: (type_identifier) @definition.class body: (_))
(class_specifier name: (type_identifier) @definition.class)
(enum_specifier name: (type_identifier) @definition.type)
(type_definition declarator: (type_identifier) @definition.type)
(alias_declaration name: (type_identifier) @definition.type)
(namespace_definition name: (namespace_identifier) @definition.module)
(function_declarator declarator: (identifier) @definition.function)
(function_declarator declarator: (field_identifier) @definition.method)
(function_declarator declarator: (qualified_identifier name: (identifier) @definition.method))
(preproc_def name: (identifier) @definition.constant)
(preproc_function_def name: (identifier) @definition.macro)

(call_expression function: (identifier) @reference.call)
(call_expression function: (field_expression field: (field_identifier) @reference.call))
(call_expression function: (qualified_identifier name: (identifier) @reference.call))
(base_class_clause (type_identifier) @reference.class)
(type_identifier) @reference.type

(preproc_include path: (_) @reference.import)

(comment) @doc
