; hybrid tags query for C (conventions in python-tags.scm).

(struct_specifier name: (type_identifier) @definition.class body: (_))
(union_specifier name: (type_identifier) @definition.class body: (_))
(enum_specifier name: (type_identifier) @definition.type)
(type_definition declarator: (type_identifier) @definition.type)
(function_definition declarator: (function_declarator declarator: (identifier) @definition.function))
(function_definition declarator: (pointer_declarator declarator: (function_declarator declarator: (identifier) @definition.function)))
(declaration declarator: (function_declarator declarator: (identifier) @definition.function))
(preproc_def name: (identifier) @definition.constant)
(preproc_function_def name: (identifier) @definition.macro)
(enumerator name: (identifier) @definition.constant)

(call_expression function: (identifier) @reference.call)
(call_expression function: (field_expression field: (field_identifier) @reference.call))
(type_identifier) @reference.type

(preproc_include path: (_) @reference.import)

(comment) @doc
