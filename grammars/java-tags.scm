; hybrid tags query for Java (conventions in python-tags.scm).

(class_declaration name: (identifier) @definition.class)
(record_declaration name: (identifier) @definition.class)
(enum_declaration name: (identifier) @definition.class)
(interface_declaration name: (identifier) @definition.interface)
(annotation_type_declaration name: (identifier) @definition.interface)
(method_declaration name: (identifier) @definition.method)
(constructor_declaration name: (identifier) @definition.method)
(field_declaration declarator: (variable_declarator name: (identifier) @definition.constant))

(method_invocation name: (identifier) @reference.call)
(object_creation_expression type: (type_identifier) @reference.class)
(superclass (type_identifier) @reference.class)
(super_interfaces (type_list (type_identifier) @reference.implementation))
(type_identifier) @reference.type
(method_invocation object: (identifier) @reference.name)

(import_declaration (scoped_identifier) @reference.import)

(block_comment) @doc
